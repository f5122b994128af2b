"""The HTML capacity report: `render` writes it, `sections` turns analysis results into sections."""
