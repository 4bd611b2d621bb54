"""Example applications (``examples.banking`` is the seed's banking agent)."""
