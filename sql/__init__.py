"""SQL shipped with cce_duck: migrations, the current schema, macros and named queries."""
