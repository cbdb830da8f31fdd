"""The `align demo` task, models and report."""
