"""What every layer stands on: configuration and settings (config, settings, parsing, validate),
errors, the registries' common form, random streams (seeds), memory and work limits (memory,
budget), where shipped files live (resources), provenance and the allocator's tuning."""
