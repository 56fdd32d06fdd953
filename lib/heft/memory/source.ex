defmodule Heft.Memory.Source do
  # Where the figures come from. Every collector takes a source instead of
  # reading "/proc" or calling :erlang directly, so that
  #   * tests point :root at a fixture directory laid out like /,
  #   * a remote node (Heft.Memory.Remote) is read with the same code: its
  #     files are read by :file.read_file on that node and its VM is asked
  #     with :erpc, which needs nothing but OTP on the far side.
  # A path given to read/2 is absolute ("/proc/meminfo"); the source prefixes
  # its root.
  @moduledoc false

  # heft?: false makes the collectors treat Heft as absent there (see
  # Heft.Memory.Remote: its handles do not work from another VM).
  defstruct root: "/", node: nil, heft?: true

  @type t :: %__MODULE__{root: Path.t(), node: node | nil, heft?: boolean}

  @doc false
  def local(root \\ "/"), do: %__MODULE__{root: root}

  @doc false
  def remote(node), do: %__MODULE__{node: node}

  # {:ok, binary} | {:error, reason}. /proc files report size 0;
  # :file.read_file reads them to EOF regardless.
  def read(%__MODULE__{node: nil, root: root}, path), do: File.read(Path.join(root, path))

  def read(%__MODULE__{node: node}, path) do
    :erpc.call(node, :file, :read_file, [path])
  catch
    kind, reason -> {:error, {kind, reason}}
  end

  # The file's contents, or nil when it cannot be read (absent on this
  # kernel, no permission): callers report such figures as unavailable.
  def read!(source, path) do
    case read(source, path) do
      {:ok, data} -> data
      {:error, _} -> nil
    end
  end

  # apply/3 on the node the source describes.
  def call(%__MODULE__{node: nil}, m, f, a), do: apply(m, f, a)
  def call(%__MODULE__{node: node}, m, f, a), do: :erpc.call(node, m, f, a)

  # Whether module `m` is loaded (or loadable) there and exports f/arity.
  def exported?(source, m, f, arity) do
    match?({:module, _}, call(source, :code, :ensure_loaded, [m])) and
      call(source, :erlang, :function_exported, [m, f, arity])
  catch
    _, _ -> false
  end
end
