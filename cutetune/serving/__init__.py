"""What the runtime serves: the plan (which point serves each token bucket, decided from the
stored winners without compiling), the serving table (rows of compiled points, lookup,
counters) and the warmup that builds the process-wide one."""
