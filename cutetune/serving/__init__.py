"""What the runtime serves: the plan (which point serves each token bucket of a problem),
decided from the stored winners without compiling anything."""
