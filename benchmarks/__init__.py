"""Side-by-side benchmarks of zlink-actors against its Python peers (`make bench`)."""
