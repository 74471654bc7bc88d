"""Helpers the tests share (no tests here): backends and devices, cases and shapes, tolerances, PTX/SASS checks, the layer's oracle checks, SM100 twins, torchtitan cases and workers."""
