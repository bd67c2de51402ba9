"""A compiled program (program.py: ``CompiledProgram``, ``compile_program``, ``compile_module``)
and what it is made of above the backends: chains of kernels run by one native call
(chains.py), kernels tried in their program (trial.py), kernels built in the background
(background.py), constant-index gathers (gather.py), metadata launches (metadata.py), how outputs
are handed back (outputs.py), views passed as pointers (pointers.py), layout guards (guards.py),
which way segments run now (segments_run.py)."""
