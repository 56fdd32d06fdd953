defmodule Heft.Memory.Remote do
  # Reports on another node over Erlang distribution, the way observer
  # attaches: this VM becomes a hidden node with a random name (hidden, so
  # the target's cluster does not see a new member), connects, and asks.
  #
  # If the target has Heft.Memory loaded, its own snapshot/0 runs there
  # (that is the only way to reach Heft tables: their handles are NIF
  # resources, meaningful only inside the VM that made them). Otherwise the
  # parts that need nothing but OTP are collected from here with :erpc:
  # :erlang.memory/0, :ets.info/1 and the target's /proc and /sys files read
  # with :file.read_file on the target, so /proc/self is the target's VM.
  # Heft figures are then nil (unavailable) and the snapshot says so.
  @moduledoc false

  alias Heft.Memory.Source

  # Starts distribution (if this VM is not distributed yet) and connects.
  # `name` is "name@host" or a bare "name" (this host is assumed).
  @spec connect(String.t(), String.t() | nil) :: {:ok, node} | {:error, String.t()}
  def connect(name, cookie) do
    target = target(name)

    with :ok <- start_distribution(target) do
      if cookie, do: Node.set_cookie(target, String.to_atom(cookie))

      if :net_kernel.hidden_connect_node(target),
        do: {:ok, target},
        else:
          {:error,
           "cannot connect to #{target}: is it running, with this cookie? " <>
             "(pass --cookie, or check ~/.erlang.cookie)"}
    end
  end

  defp target(name) do
    if String.contains?(name, "@"),
      do: String.to_atom(name),
      else: :"#{name}@#{:net_adm.localhost() |> to_string() |> String.split(".") |> hd()}"
  end

  defp start_distribution(target) do
    if Node.alive?() do
      :ok
    else
      host = target |> Atom.to_string() |> String.split("@") |> List.last()
      domain = if String.contains?(host, "."), do: :longnames, else: :shortnames
      me = :"heft_report_#{:rand.uniform(1_000_000_000)}"

      case :net_kernel.start(me, %{name_domain: domain, hidden: true}) do
        {:ok, _} ->
          :ok

        {:error, reason} ->
          {:error,
           "cannot start distribution (#{inspect(reason)}): is epmd running? " <>
             "It is whenever the target node is."}
      end
    end
  end

  # The snapshot of `node`, as Heft.Memory.snapshot/0 would return it there.
  @spec snapshot(node) :: map
  def snapshot(node) do
    source = Source.remote(node)

    if Source.exported?(source, Heft.Memory, :snapshot, 0) do
      :erpc.call(node, Heft.Memory, :snapshot, [])
    else
      fallback(source)
    end
  catch
    # Heft.Memory is there but cannot run (an Erlang node without Elixir's
    # own modules, a version that differs): take the OTP parts instead.
    :error, {:exception, _, _} -> fallback(Source.remote(node))
  end

  defp fallback(source), do: Heft.Memory.collect(%{source | heft?: false})
end
