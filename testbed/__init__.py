"""Test beds: real engines and servers that tests, benches and the demo run against (not product code)."""
