"""Protobuf schemas written from public upstream definitions, and their generated code."""
