"""conftest.missing_data, which skips a test whose shared data are absent: it reads the missing
path out of an error message, and only a path under the shared data that does not exist counts.
The skip, and the failure under LAPLAX_REQUIRE_DATA=1, in a pytest process:
tests/integration/test_missing_data.py."""



from conftest import missing_data


def test_missing_data_reads_paths_out_of_messages(shared_data):
  assert missing_data(f"error: {shared_data / 'arc' / 'nope.jsonl'} does not exist").startswith(
      f"needs {shared_data / 'arc' / 'nope.jsonl'}: the shared data")
  assert missing_data(f"error: bad value in {shared_data / 'arc'}") is None  # it exists
  assert missing_data("error: /elsewhere/x does not exist") is None
