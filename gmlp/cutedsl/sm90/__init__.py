"""CuTeDSL kernels of the Hopper (sm_90a) production path: TMA + wgmma grouped GEMMs over expert
rows given by device prefix sums (issue 12). Importing a kernel module imports cutlass-dsl."""
