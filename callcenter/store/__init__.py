"""The system of record every worker on every host shares: queues, agents and their states, workers
and their heartbeats, and one row per call. Embedded SQLite by default (no server), PostgreSQL for a
center of several machines; one schema, versioned (`callcenter.store.schema`), one setting (`store:`
in the server config, see `callcenter.store.url`)."""
