"""The only I/O: the API client, the watches and their Store, the loop, leader election, probes, metrics."""
