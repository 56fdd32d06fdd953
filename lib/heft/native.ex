defmodule Heft.Native do
  # The NIF stubs, replaced by native/heft_nif when the module loads; the
  # bodies below only run if the library failed to load.
  #
  # Calling convention of the data operations (native/heft_nif/src/ops.rs):
  # each has a normal-scheduler NIF `op` and two dirty twins `op_cpu`
  # (DirtyCpu) and `op_io` (DirtyIo). `op` works within a budget of about a
  # millisecond and answers `:"$heft_cpu"` when the job is bigger, or
  # `:"$heft_io"` at once when the table's arena is a file (or, for a write
  # to a persistent table, when its log needs a new segment first); the
  # caller then makes the same call to the named twin. `Heft` does this through
  # `Heft.Native.call/1` below.
  @moduledoc false
  @on_load :load_nif
  # load_nif/0 asks Heft.VM, so it must be there when this module loads
  # (at compile time too, for the modules that import this one).
  Code.ensure_compiled!(Heft.VM)

  def load_nif do
    path = :filename.join(:code.priv_dir(:heft), ~c"native/libheft_nif")
    # Learnt at run time, from the ETS of the VM that loads the NIF.
    vm = Heft.VM.facts()

    :erlang.load_nif(path, %{
      "neg_zero_is_zero" => vm.neg_zero_is_zero,
      "bag_batch_reversed" => vm.bag_batch_reversed
    })
  end

  @ops [
    insert: 2,
    insert_new: 2,
    insert_ttl: 3,
    insert_new_ttl: 3,
    lookup: 2,
    lookup_element: 3,
    member: 2,
    take: 2,
    delete_key: 2,
    delete_object: 2,
    delete_all_objects: 1,
    update_counter: 4,
    update_element: 3,
    first: 1,
    next: 2,
    last: 1,
    prev: 2,
    chunk: 3,
    chunk_back: 3,
    range_chunk: 4,
    range_chunk_back: 4,
    slot: 2,
    size: 1,
    key_cursor: 2,
    # Select's sieved walk (ops.rs; its sieve's terms: native/heft_nif/src/sieve.rs)
    sieve_chunk: 6,
    sieve_count: 5,
    # Match specifications (native/heft_nif/src/select.rs)
    delete_objects: 2,
    replace_objects: 2,
    delete_arity: 3
  ]

  for {name, arity} <- @ops, variant <- [name, :"#{name}_cpu", :"#{name}_io"] do
    args = Macro.generate_arguments(arity, __MODULE__)
    def unquote(variant)(unquote_splicing(args)), do: :erlang.nif_error(:heft_nif_not_loaded)
  end

  # Operations that change the table. On a `sync: :commit` table they
  # answer `{:"$heft_wait", ticket, result}` once their change is logged;
  # the table's flusher thread sends `{:"$heft_done", ticket, outcome}`
  # when it is on stable storage (native/heft_nif/src/persist.rs).
  @write_ops [
    :insert,
    :insert_new,
    :insert_ttl,
    :insert_new_ttl,
    :take,
    :delete_key,
    :delete_object,
    :delete_all_objects,
    :update_counter,
    :update_element,
    # select.rs
    :delete_objects,
    :replace_objects,
    :delete_arity
  ]

  @doc false
  # `call(op(args...))`: makes the normal call and, if it answers with a
  # retry marker, the same call to the dirty twin it names; a write then
  # waits for its commit if the answer says so. The arguments must be
  # variables or literals (they are evaluated again on retry).
  defmacro call({name, _, args}) do
    cpu = :"#{name}_cpu"
    io = :"#{name}_io"

    if name in @write_ops do
      # A write on DirtyCpu may still need the DirtyIo twin (a persistent
      # table whose log needs a new segment first).
      quote do
        case Heft.Native.unquote(name)(unquote_splicing(args)) do
          :"$heft_cpu" ->
            case Heft.Native.unquote(cpu)(unquote_splicing(args)) do
              :"$heft_io" -> Heft.Native.await(Heft.Native.unquote(io)(unquote_splicing(args)))
              result -> Heft.Native.await(result)
            end

          :"$heft_io" ->
            Heft.Native.await(Heft.Native.unquote(io)(unquote_splicing(args)))

          result ->
            Heft.Native.await(result)
        end
      end
    else
      quote do
        case Heft.Native.unquote(name)(unquote_splicing(args)) do
          :"$heft_cpu" -> Heft.Native.unquote(cpu)(unquote_splicing(args))
          :"$heft_io" -> Heft.Native.unquote(io)(unquote_splicing(args))
          result -> result
        end
      end
    end
  end

  @doc false
  # Waits for a commit or a dump: `{:"$heft_wait", ticket, result}` becomes
  # `result` once the table's thread answers `:ok`, or its `{:error, _}`.
  # Anything else is returned as it is.
  def await({:"$heft_wait", ticket, result}) do
    receive do
      {:"$heft_done", ^ticket, :ok} -> result
      {:"$heft_done", ^ticket, {:error, _} = error} -> error
    end
  end

  def await(result), do: result

  # Persistence (native/heft_nif/src/persist.rs).
  def persist_meta_io(_dir), do: :erlang.nif_error(:heft_nif_not_loaded)

  # Keys stored under the other zero rule (native/heft_nif/src/migrate.rs).
  def zero_keys_cpu(_tab, _cursor, _apply), do: :erlang.nif_error(:heft_nif_not_loaded)
  def set_zero_rule(_merged), do: :erlang.nif_error(:heft_nif_not_loaded)

  def persist_open_io(_name, _args, _dir, _popts, _meta),
    do: :erlang.nif_error(:heft_nif_not_loaded)

  def persist_close_io(_tab, _remove), do: :erlang.nif_error(:heft_nif_not_loaded)
  def persist_write_meta_io(_tab, _meta), do: :erlang.nif_error(:heft_nif_not_loaded)
  def persist_sync(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)
  def persist_dump(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)
  def persist_subscribe(_tab, _pid, _on), do: :erlang.nif_error(:heft_nif_not_loaded)
  def persist_info(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)
  def persist_inject_fault(_tab, _fault, _n), do: :erlang.nif_error(:heft_nif_not_loaded)

  def new(_name, _opts), do: :erlang.nif_error(:heft_nif_not_loaded)
  def new_io(_name, _opts), do: :erlang.nif_error(:heft_nif_not_loaded)
  def delete_table(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)
  def delete_table_cpu(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)
  def give_away(_tab, _pid, _data), do: :erlang.nif_error(:heft_nif_not_loaded)
  def set_heir(_tab, _heir), do: :erlang.nif_error(:heft_nif_not_loaded)
  def set_protection(_tab, _protection), do: :erlang.nif_error(:heft_nif_not_loaded)
  def rename(_tab, _name), do: :erlang.nif_error(:heft_nif_not_loaded)
  def whereis(_name), do: :erlang.nif_error(:heft_nif_not_loaded)
  def all, do: :erlang.nif_error(:heft_nif_not_loaded)
  def info(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)
  def info_cpu(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)

  # The table's facts as a map: `info/1`, or `info_cpu/1` when it asks
  # (counting many expired objects not yet swept).
  def info_map(tab) do
    case info(tab) do
      :"$heft_cpu" -> info_cpu(tab)
      map -> map
    end
  end

  def kernel_view(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)
  def safe_fixtable(_tab, _on, _now), do: :erlang.nif_error(:heft_nif_not_loaded)
  def safe_fixtable_cpu(_tab, _on, _now), do: :erlang.nif_error(:heft_nif_not_loaded)
  def fixations(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)
  def live_tables, do: :erlang.nif_error(:heft_nif_not_loaded)
  def term_layout_checked, do: :erlang.nif_error(:heft_nif_not_loaded)
  def anonymous_arenas, do: :erlang.nif_error(:heft_nif_not_loaded)
  def debug_panic, do: :erlang.nif_error(:heft_nif_not_loaded)
  def debug_hold_lock(_tab, _ms), do: :erlang.nif_error(:heft_nif_not_loaded)

  # Heft.Memory.sizing/3's codec predictions (sizing.rs; DirtyCpu).
  def sizing_predict(_samples, _keypos, _bag, _compressions, _dictionary_bytes),
    do: :erlang.nif_error(:heft_nif_not_loaded)

  # Learning (native/heft_nif/src/learn.rs)
  def train_dictionary(_tab, _samples, _max_bytes, _recompress, _tag),
    do: :erlang.nif_error(:heft_nif_not_loaded)

  def learn_defaults, do: :erlang.nif_error(:heft_nif_not_loaded)

  # Compaction (native/heft_nif/src/compact.rs)
  def compact(_tab, _tag), do: :erlang.nif_error(:heft_nif_not_loaded)

  # Match specifications and table files (select.rs, tab_file.rs)
  def select_access(_tab, _write), do: :erlang.nif_error(:heft_nif_not_loaded)
  def tmp_create(_dest, _mode), do: :erlang.nif_error(:heft_nif_not_loaded)
  def tmp_write(_tmp, _bytes), do: :erlang.nif_error(:heft_nif_not_loaded)
  def tmp_finish(_tmp, _commit, _sync), do: :erlang.nif_error(:heft_nif_not_loaded)
  def tab_dictionaries(_tab), do: :erlang.nif_error(:heft_nif_not_loaded)
  def tab_add_dictionary(_tab, _bytes), do: :erlang.nif_error(:heft_nif_not_loaded)
end
