"""The AOT artifact writer: C glue, header, package stub, metadata."""
