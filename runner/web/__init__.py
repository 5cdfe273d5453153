"""The controller's web page: jobs, restart timelines, logs and costs, for a browser signed in by `runner dashboard`."""
