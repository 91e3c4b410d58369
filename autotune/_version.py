"""The release number, in one place below every stage (pyproject.toml declares the same; a
test keeps them equal), so that the CLI can print it from a source checkout that has no package
metadata."""

VERSION = "0.1.0"
