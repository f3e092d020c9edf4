"""What the benchmarks in `bench/` share: timing rounds, host, results, model builders, data.

A benchmark puts `bench/` on `sys.path` (run as a script it is there already) and
imports the parts it needs:

- `common.timing`: interleaved timing rounds (warm-up as long as a round, the order
  rotating from round to round, min and median), the best of several and ratios to it;
- `common.host`: the CPU's model name and flags (`lscpu`), cores, load, versions;
- `common.report`: strict, atomically written JSON, recorded failures, markdown tables;
- `common.models`: the Keras model builders several benchmarks time (any backend);
- `common.data`: the synthetic data they train on (NumPy, fixed seeds);
- `common.keras_tools`: a benchmark model (`Workload`: build, data, batch, loss),
  builds under Keras' global dtype policy, fresh copies with given weights, train
  steps, the search within a val_loss budget, autoprec's shown lines captured, plans
  summarised;
- `common.fitting`: timing steps inside `fit` and `tf.data` input (TensorFlow).

Only `common.fitting` imports TensorFlow, and nothing here imports Optuna: `bench/gpu.py`
runs where neither can be imported (JAX, Keras on its JAX backend).
"""
