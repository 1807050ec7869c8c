"""`pgembed serve`: search over HTTP from a process that keeps its models loaded (docs/serve.md).

api.py turns a request's JSON into a search and an error into a status; server.py is the HTTP
server (the standard library's ThreadingHTTPServer); page.py is the search page it serves at `/`.
"""
