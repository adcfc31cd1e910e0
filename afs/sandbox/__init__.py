"""The sandbox: an embedded PostgreSQL 18 with the demo data set, the default target.

    server.py    start, stop and inspect the embedded server (pg_ctl, initdb)
    demo.py      the demo data set, as SQL (pure)
    seeding.py   create / refresh the demo database and its fork template
    importer.py  copy a user's database into the sandbox (pg_dump | pg_restore)
"""
