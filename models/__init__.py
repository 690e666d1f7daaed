"""Model files with their manifests, and the code that reads them."""
