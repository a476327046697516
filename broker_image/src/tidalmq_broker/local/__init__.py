"""The embedded local cluster behind `tidalmq local up`."""
