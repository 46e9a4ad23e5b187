"""Wire adapters: client events to engine calls, engine events to wire events."""
