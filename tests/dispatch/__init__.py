"""Tests of gmlp.dispatch: paths and providers, the layer's plan under simulated systems, and explain() pinned against explain_plans.txt."""
