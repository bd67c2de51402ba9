"""What every launch writes into a program's generated function, below the backends: the
function's code (wrapper.py), the views it makes from the plan (views.py), a mutated input's
value written straight into its storage (inplace.py)."""
