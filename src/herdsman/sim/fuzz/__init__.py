"""``herdsman sim fuzz``: seeded faults through the whole supervisor, checked after each event."""
