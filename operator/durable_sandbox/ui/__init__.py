"""`dsb ui`: a web view of runs, for the local store and for a cluster, on the client code the CLI uses.

:mod:`ui.source` is the protocol the pages are written against (:mod:`ui.local`, :mod:`ui.cluster`);
:mod:`ui.timeline` folds a run's journal and events into the run page's timeline; :mod:`ui.security` is
who may use it; :mod:`ui.app` the application, its routes one module per job (:mod:`ui.pages`,
:mod:`ui.records`, :mod:`ui.streams`, :mod:`ui.actions`); :mod:`ui.server` serving it. Templates and the small front end
(``templates/``, ``static/``) ship in the package: no build step, nothing fetched at run time.
"""
