"""Tests of gmlp.integrations: torchtitan's experts, its flag check, and distributed runs on gloo."""
