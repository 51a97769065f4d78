"""Device drivers. Each imports its own library only when it is used."""
