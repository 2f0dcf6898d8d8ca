"""tracerl's YAML configs, shipped inside the package as ``core.conf``; the repository root links it as ``conf/``."""
