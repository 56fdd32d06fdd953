defmodule Heft.Error do
  @moduledoc """
  Raised when Heft cannot do I/O it needs to create a table, for example
  when the directory of a file arena is not writable.

  `reason` is a POSIX atom such as `:enoent`, `:eacces`, `:enospc` or
  `:eio`, as in `File.Error`, or for a persistent table one of the
  reasons `Heft.open/2` documents (`:locked`, `{:corrupt, file, offset}`,
  `{:unsupported_version, file, version}`).
  """

  defexception [:reason, :action]

  @impl true
  def message(%{reason: reason, action: action}) do
    "could not #{action}: #{describe(reason)} (#{inspect(reason)})"
  end

  defp describe(:locked), do: "the table is open elsewhere (its directory is locked)"
  defp describe({:corrupt, file, offset}), do: "#{file} is damaged at byte #{offset}"

  defp describe({:unsupported_version, file, v}),
    do: "#{file} has format version #{v}, newer than this Heft's"

  defp describe(:zero_key_conflict),
    do: "keys that differ only in the sign of a zero would become one key on this VM"

  defp describe(reason) when is_atom(reason), do: :file.format_error(reason)
  defp describe(_reason), do: "failed"
end
