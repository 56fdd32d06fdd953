defmodule Heft.Error do
  @moduledoc """
  Raised when Heft cannot do I/O it needs to create a table, for example
  when the directory of a file arena is not writable.

  `reason` is a POSIX atom such as `:enoent`, `:eacces`, `:enospc` or
  `:eio`, as in `File.Error`.
  """

  defexception [:reason, :action]

  @impl true
  def message(%{reason: reason, action: action}) do
    "could not #{action}: #{:file.format_error(reason)} (#{inspect(reason)})"
  end
end
