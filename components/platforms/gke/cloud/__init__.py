"""The gke platform's calls to Google Cloud and the cluster's Kubernetes API, one adapter per API, and a run's clients.

Imports ``plan`` only (the resource names, the run's target); ``checks`` and ``run`` import it.
"""
