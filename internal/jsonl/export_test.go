package jsonl

// AppendString exposes appendString to the tests.
var AppendString = appendString
