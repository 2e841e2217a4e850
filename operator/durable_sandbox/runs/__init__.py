"""Opening runs, as `dsb` and the web view both do: the local store's engine or a cluster's runs.

``session`` opens the one or the other from the command line's ``settings``; ``cluster`` is a cluster's runs
as the engine's methods; ``errors`` the one error type (``CliError``) that stops with a message and an exit
code; ``detach`` starts a `dsb` in the background with its detach log; ``envfiles`` keeps literal env values
out of a local run's stored input. The CLI (``cli/``) and the web view (``ui/``) sit above, side by side.
"""
