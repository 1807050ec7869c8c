"""`pgembed serve`: search over HTTP from a process that keeps its models loaded (docs/serve.md).

api.py turns a request's JSON into a search and an error into a status; app.py is the HTTP
layer (a Starlette application: routes, the origin check, the body's limits); guards.py its
middleware (the Host check, the limit on requests in flight, headers, the log line); server.py
runs it on uvicorn in a thread of its own, with front.py in front of each connection (the
request head's deadline, a JSON 400 for one that cannot be parsed); page.py is the search page.
"""
