"""The operator process as one object: its frozen configuration, the application and the tasks beside it."""
