"""The `pgembed` command line: thin click commands, one module per command group; the work
happens in the packages they call."""

from pgembed.cli import data, db, demo, embed, model, quality, query, reindex, serve, status, sync
from pgembed.cli.app import App, main

for _command in (
    data.migrate_cmd,
    model.model_group,
    model.alter_table_cmd,
    sync.sync_cmd,
    query.query_cmd,
    embed.embed_cmd,
    status.status_cmd,
    sync.retry_cmd,
    demo.demo_cmd,
    reindex.reindex_cmd,
    quality.eval_cmd,
    quality.tune_cmd,
    data.load_cmd,
    db.db_group,
    serve.serve_cmd,
):
    main.add_command(_command)

__all__ = ["App", "main"]
