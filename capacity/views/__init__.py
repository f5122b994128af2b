"""All Altair code: one style, one chart per result, shared by the report and the notebooks."""
