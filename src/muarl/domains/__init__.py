"""Built-in domains (retail, airline, telecom). Each is a package that uses only muarl's public API."""
