defmodule Heft.Test.MnesiaNode do
  # Mnesia set-ups for the heft_mnesia tests (test/mnesia/), usable in this
  # VM and, by remote calls, in a child VM started with :peer (this module
  # is compiled into the test ebin, which the child gets on its path).
  @moduledoc false

  @backends [heft_copies: :heft_mnesia, heft_ram_copies: :heft_mnesia]

  @doc """
  Starts a child VM with this VM's code path and Elixir started, driven over
  its standard I/O; `peer` adds :peer options (`name:`, for a distributed
  one) and `args` its command-line arguments.
  """
  def peer(peer \\ %{}, args \\ []) do
    args = args ++ Enum.flat_map(:code.get_path(), &[~c"-pa", &1])

    {:ok, vm} =
      case :peer.start(Map.merge(%{connection: :standard_io, args: args}, peer)) do
        {:ok, vm} -> {:ok, vm}
        {:ok, vm, _node} -> {:ok, vm}
      end

    {:ok, _} = :peer.call(vm, :application, :ensure_all_started, [:elixir])
    vm
  end

  @doc "Stops Mnesia, points it at `dir` and starts it, creating a schema with Heft's aliases if `dir` has none."
  def start(dir) do
    _ = :mnesia.stop()
    :ok = :application.load(:mnesia) |> loaded()
    :ok = :application.set_env(:mnesia, :dir, String.to_charlist(dir))
    # A fatal error's core dump goes beside the directory, not into the cwd.
    :ok = :application.set_env(:mnesia, :core_dir, String.to_charlist(Path.dirname(dir)))

    unless File.exists?(Path.join(dir, "schema.DAT")) do
      :ok = :mnesia.create_schema([node()], backend_types: @backends)
    end

    :ok = :mnesia.start()
    :ok
  end

  defp loaded(:ok), do: :ok
  defp loaded({:error, {:already_loaded, :mnesia}}), do: :ok

  @doc "Points Mnesia at `dir` (not started)."
  def set_dir(dir) do
    :ok = :application.load(:mnesia) |> loaded()
    :application.set_env(:mnesia, :dir, String.to_charlist(dir))
  end

  @doc "A schema with Heft's aliases on `nodes` (each pointed at its directory, Mnesia stopped)."
  def create_schema(nodes), do: :mnesia.create_schema(nodes, backend_types: @backends)

  @doc "Stops Mnesia."
  def stop, do: :mnesia.stop()

  @doc "Waits for tables to be loaded."
  def wait(tabs), do: :mnesia.wait_for_tables(tabs, 30_000)

  @doc "A transaction writing each record."
  def write_all(records),
    do: :mnesia.transaction(fn -> Enum.each(records, &:mnesia.write/1) end)

  @doc "A transaction deleting each key of `tab`."
  def delete_all(tab, keys),
    do: :mnesia.transaction(fn -> Enum.each(keys, &:mnesia.delete({tab, &1})) end)

  @doc "Every record of `tab` (sorted), read in a transaction."
  def all(tab),
    do: :mnesia.transaction(fn -> :mnesia.match_object({tab, :_, :_}) |> Enum.sort() end)

  @doc "The keys of `tab` whose `attr` is `value`, by index."
  def index_keys(tab, value, attr),
    do: tab |> :mnesia.dirty_index_read(value, attr) |> Enum.map(&elem(&1, 1)) |> Enum.sort()

  @doc "Runs `fun` as a mnesia_frag activity of `kind`."
  def frag(kind, fun), do: :mnesia.activity(kind, fun, [], :mnesia_frag)

  @doc "The fragments of `tab`."
  def frag_names(tab), do: frag(:sync_dirty, fn -> :mnesia.table_info(tab, :frag_names) end)

  @doc "Writes `records` into the fragmented table in one transaction."
  def frag_write(records), do: frag(:transaction, fn -> Enum.each(records, &:mnesia.write/1) end)

  @doc "Reads `keys` of the fragmented table `tab` (dirty)."
  def frag_read(tab, keys),
    do: frag(:sync_dirty, fn -> Enum.flat_map(keys, &:mnesia.read(tab, &1)) end)

  @doc "Every record of the fragmented table `tab`, sorted."
  def frag_all(tab),
    do: frag(:transaction, fn -> :mnesia.match_object({tab, :_, :_}) end) |> Enum.sort()

  @doc "Makes the next `n` log writes of heft_mnesia's table `tab` fail with `fault` (Heft's fault injection)."
  def inject_fault(alias, tab, fault, n) do
    %Heft.Table{ref: ref} = :heft_mnesia_admin.handle(alias, tab)
    Heft.Native.persist_inject_fault(ref, fault, n)
  end

  @doc "Runs `{m, f, a}` and returns `{:ok, result}` or `{:exit, reason}`."
  def try_call(m, f, a) do
    {:ok, apply(m, f, a)}
  catch
    :exit, reason -> {:exit, reason}
  end

  @doc "Waits up to `ms` for Mnesia to stop running here; returns `mnesia:system_info(is_running)`."
  def await_not_running(ms) do
    case :mnesia.system_info(:is_running) do
      :no -> :no
      _ when ms <= 0 -> :mnesia.system_info(:is_running)
      _ -> Process.sleep(100) && await_not_running(ms - 100)
    end
  end

  @doc "This OS process's pid."
  def os_pid, do: String.to_integer(System.pid())
end
