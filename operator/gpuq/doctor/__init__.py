"""`gpuq doctor`: the seed article's health check, validating scheduler integration and resources."""
