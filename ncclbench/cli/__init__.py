"""Command line: Click commands only; each one parses its options and calls the API, the engine or a tool."""
