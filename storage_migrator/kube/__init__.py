"""The Kubernetes access layer: one verb per module (STYLE "Do this" 1).

``connection`` builds clients, ``errors`` classifies failures, ``resources``
builds paths, ``transport`` sends requests, ``discovery`` / ``listing`` /
``reading`` / ``writing`` are the verbs. Migrated objects stay raw JSON here.
"""
