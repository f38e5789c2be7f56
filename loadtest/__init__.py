"""Concurrency-sweep load generator for OpenAI-compatible servers, with reports and plots."""
