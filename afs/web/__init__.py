"""The execution monitor: the pages `afs serve` shows in a browser, and the JSON they read.

    /                     the tasks (status, query, winner, measured gain, age) and the submit form
    /tasks/{id}           one task, live: a lane per agent filling from the event stream; the
                          charts, scores, winner SQL and every candidate once it has finished
    /batches, /batches/{id}, /audit   the batch reports and the audit log of applies
    /static/…             the page's script and style (shipped in the package; no build step)

The pages are one HTML shell; `static/app.js` draws them from the JSON API (the same
POST /v1/tasks validates the form). The task list and a task page come with their first state
drawn by the server (pages.py: the task, its lanes, its winner), so the HTML has the data
before any script runs; the script then draws over it and keeps it live. JSON added here
(routes.py): /v1/board (tasks with their winner and gain), /v1/tasks/{id}/log (events so far,
for a reload), /v1/batches, /v1/batches/{id}, /v1/audit.
"""

from afs.web.routes import OPENAPI_PATHS, web_routes

__all__ = ["OPENAPI_PATHS", "web_routes"]
