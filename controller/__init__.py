"""pidctl's controller: pure state machines, the durable metadata log, and the trio server."""
