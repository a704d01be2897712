"""The analysis report: its document, the rules that turn facts into findings, and
its text and HTML renderings."""
