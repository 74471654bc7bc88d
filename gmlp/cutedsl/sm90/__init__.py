"""CuTeDSL kernels of the Hopper (sm_90a) production path: TMA + wgmma grouped GEMMs over expert
rows given by device prefix sums (issue 12). Importing a kernel module imports cutlass-dsl.

Each kernel is the twin of a Triton launcher (same arguments and outputs):

- ``grouped_gemm``: ``A @ B_g^T (+ bias)`` per expert (FC2 forward, FC1 dgrad), bf16 out;
- ``fc1``: FC1 + bias + activation + probs, c in bf16 and a in bf16 or (MXFP8) quantized both ways
  (Q_row(a), Q_col(a), bit for bit the Triton kernel's);
- ``fc2_dgrad``: FC2 dgrad + activation backward + deterministic dprobs and db1 partials, dh in
  bf16 or (MXFP8, tile_n 128) quantized both ways in the gradient format (Q_row(dh), Q_col(dh), bit
  for bit the Triton kernel's);
- ``wgrad``: ``dW_g = A_g^T @ B_g`` over each expert's rows (a ragged K), stored or added into
  an fp32 ``main_grad``;
- ``blockwise_gemm``, ``blockwise_fc1``, ``blockwise_fc2_dgrad``, ``blockwise_wgrad``: the same
  sites in the FP8 blockwise recipe (1 x 128 tokens, 128 x 128 weight tiles, promoted fp32 sums).

Every kernel is a site of one engine, ``_engine.GroupedGemmEngine``: one kernel skeleton (roles,
slot ring, the cooperative schedule, the work-item loop, clusters of two) into which a site plugs
its operands, operand policy (producer and k-loop: bf16, FP8 promoted 1D2D in
``_blockwise_mainloop``, 1D1D for the blockwise weight gradient) and epilogue; ``configs`` holds what each kernel is
compiled for. Shared machinery: ``_schedule`` (persistent work items over experts, found on the
device: ``TokenItems`` over ragged rows, ``ExpertTiles`` over a ragged K),
``_pipeline`` (TMA descriptors, the mbarrier pipeline, producer and wgmma consumer k-loops),
``_epilogue_math`` (the activations
forward and backward in the Triton epilogues' fp32 operation order), ``_quantize_epilogue`` (MXFP8
Q_row and Q_col of a 128 x 128 accumulator tile with the quantize kernel's block math and
transposed store), ``_compile`` (the cached compile of a config, ahead of time without a GPU for
the tests, and the symbolic stand-ins of the arguments), ``_launch`` (the launchers' common
checks, one message each, the FC1 / FC2 dgrad problem rule, the run of a compiled config).
``support`` says what each kernel runs at each GEMM site of the layer and gives the dispatcher
the launchers (imported lazily: this package imports without cutlass-dsl); ``launch_options``
chooses each launch's knobs (tile width, epilogue store, cluster, ...) from the defaults, the
tuned table (``tuned``, written by ``python -m gmlp.bench tune``) and ``GMLP_SM90_CONFIG``.
Verified on the H200 against the oracle and the Triton twins; the dispatcher takes them on 9.x.
"""
