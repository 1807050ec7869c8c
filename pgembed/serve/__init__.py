"""`pgembed serve`: search over HTTP from a process that keeps its models loaded (docs/serve.md).

api.py turns a request's JSON into a search and an error into a status; app.py is the HTTP
layer (a Starlette application: routes, the Host and origin checks, limits, headers, the log
line); server.py runs it on uvicorn in a thread of its own; page.py is the search page at `/`.
"""
