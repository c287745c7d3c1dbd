"""What executes a stage: Celery app and tasks, ADK agents, models, tools."""
