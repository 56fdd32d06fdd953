defmodule Heft.EtsTabFile do
  # file2tab/2 and tabfile_info/1 of the files ETS's tab2file/2,3 writes,
  # so that a table dumped by ETS loads into Heft (Heft.TabFile hands them
  # here: they begin with disk_log's magic, 1 2 3 4). Such a file is a
  # disk_log halt log of terms:
  #
  #   header   a tuple of {key, value}: name, type, protection,
  #            named_table, keypos, size (the six a file must have), and
  #            what else ETS's info/1 said, major_version, minor_version
  #            and extended_info (a list of object_count and md5sum)
  #   objects  the table's objects, one term each
  #   end      ['$end_of_table', [{count, n}, {md5, digest}]], with what
  #            extended_info promised (absent if it promised nothing)
  #
  # The md5 digest covers the external format of the header and of every
  # object, as logged. With `verify: true` a file must keep its promises:
  # the digest, the count (the end's, else the header's size), and no
  # damaged bytes. Errors are ETS's: :badfile, :cannot_create_table,
  # :invalid_object_count, :checksum_error, {:read_error, reason} and
  # {:unsupported_file_version, {major, minor}}.
  @moduledoc false

  @mandatory [:name, :type, :protection, :named_table, :keypos, :size]
  @types [:set, :ordered_set, :bag, :duplicate_bag]
  @chunk 100

  @spec read(Path.t(), keyword) :: {:ok, Heft.tab()} | {:error, term}
  def read(filename, opts) do
    verify = Keyword.get(opts, :verify, false)

    with_log(filename, verify, fn log ->
      with {:ok, header, bin, cont} <- header(log) do
        md5 =
          if verify and :md5sum in header.extended_info,
            do: :erlang.md5_update(:erlang.md5_init(), bin)

        with {:ok, tab} <- create(header, opts) do
          case load(log, tab, cont, verify, md5, 0) do
            {:ok, count, ending} ->
              case check(header, verify, md5, count, ending) do
                :ok -> {:ok, tab}
                error -> drop(tab, error)
              end

            error ->
              drop(tab, error)
          end
        end
      end
    end)
  end

  # The header's items: ETS's info/1 items, as Heft's info/1 answers them,
  # but the identifier (a Heft.Table or a name, not ETS's reference) and
  # the memory (bytes, not ETS's words). ETS's file2tab reads the six
  # @mandatory ones, :compressed, :read_concurrency and
  # :write_concurrency.
  @header_items Heft.__ets_info_items__() -- [:id, :memory]

  @spec write(Heft.tab(), Path.t(), keyword) :: :ok | {:error, term}
  def write(tab, filename, opts) do
    extended = Keyword.get(opts, :extended_info, [])
    dest = filename |> IO.chardata_to_string() |> Path.expand()

    # disk_log makes the file itself: in a directory of our own (so no
    # link can be planted where it writes), then renamed over `dest`.
    with {:ok, dir} <- private_dir(Path.dirname(dest)) do
      file = Path.join(dir, "tab")

      try do
        with :ok <- log(tab, file, extended, Keyword.get(opts, :sync, false)),
             do: :file.rename(file, dest)
      after
        _ = :file.delete(file)
        _ = :file.del_dir(dir)
      end
    end
  end

  defp log(tab, file, extended, sync) do
    name = {__MODULE__, make_ref()}

    case :disk_log.open(name: name, file: String.to_charlist(file)) do
      {:ok, ^name} ->
        result =
          try do
            log_all(name, tab, extended, sync)
          catch
            {:disk_log, reason} -> {:error, reason}
          end

        case {result, :disk_log.close(name)} do
          {:ok, {:error, reason}} -> {:error, reason}
          {result, _} -> result
        end

      {:error, reason} ->
        {:error, reason}
    end
  end

  defp log_all(log, tab, extended, sync) do
    info = Heft.info(tab)
    md5? = :md5sum in extended

    header =
      (for(k <- @header_items, do: {k, Keyword.fetch!(info, k)}) ++
         [
           major_version: 1,
           minor_version: 0,
           extended_info: Enum.filter([:object_count, :md5sum], &(&1 in extended))
         ])
      |> List.to_tuple()

    md5 = put(log, [header], md5? && :erlang.md5_init())
    {md5, count} = put_objects(log, Heft.select(tab, [{:_, [], [:"$_"]}], 100), md5, 0)

    ending =
      if(:object_count in extended, do: [count: count], else: []) ++
        if md5?, do: [md5: :erlang.md5_final(md5)], else: []

    if ending != [], do: put(log, [[:"$end_of_table", ending]], false)
    if sync, do: ok!(:disk_log.sync(log))
    :ok
  end

  defp put_objects(_log, :"$end_of_table", md5, count), do: {md5, count}

  defp put_objects(log, {objects, cont}, md5, count),
    do: put_objects(log, Heft.select(cont), put(log, objects, md5), count + length(objects))

  # Logs `terms`; with an MD5 context, as their external format, which
  # goes into the digest (what ETS's file2tab checks).
  defp put(log, terms, false) do
    ok!(:disk_log.log_terms(log, terms))
    false
  end

  defp put(log, terms, md5) do
    bins = Enum.map(terms, &:erlang.term_to_binary/1)
    ok!(:disk_log.blog_terms(log, bins))
    Enum.reduce(bins, md5, &:erlang.md5_update(&2, &1))
  end

  defp ok!(:ok), do: :ok
  defp ok!({:error, reason}), do: throw({:disk_log, reason})

  # A new directory beside `parent`'s files, mode 0700, that holds nothing:
  # once it is ours alone and empty, nothing in it can be another's link.
  defp private_dir(parent) do
    dir = Path.join(parent, ".heft-tab-" <> Base.url_encode64(:rand.bytes(9), padding: false))

    case :file.make_dir(dir) do
      :ok ->
        with :ok <- :file.change_mode(dir, 0o700),
             {:ok, []} <- :file.list_dir(dir) do
          {:ok, dir}
        else
          _ ->
            _ = :file.del_dir(dir)
            {:error, :eexist}
        end

      {:error, :eexist} ->
        private_dir(parent)

      {:error, reason} ->
        {:error, reason}
    end
  end

  @spec info(Path.t()) :: {:ok, keyword} | {:error, term}
  def info(filename) do
    with_log(filename, false, fn log ->
      with {:ok, h, _bin, _cont} <- header(log) do
        {:ok,
         [
           name: h.name,
           type: h.type,
           protection: h.protection,
           named_table: h.named_table,
           keypos: h.keypos,
           size: h.size,
           extended_info: h.extended_info,
           version: h.version
         ]}
      end
    end)
  end

  defp drop(tab, error) do
    _ = Heft.delete(tab)
    error
  end

  # Runs `fun` on the file opened as a read-only disk_log, closed after.
  # A log disk_log had to repair (damaged) is :badfile when verifying.
  defp with_log(filename, verify, fun) do
    name = {__MODULE__, make_ref()}
    file = filename |> IO.chardata_to_string() |> String.to_charlist()

    case :disk_log.open(name: name, file: file, mode: :read_only) do
      {:ok, ^name} -> run(name, fun)
      {:repaired, ^name, _, _} when verify -> close(name, {:error, :badfile})
      {:repaired, ^name, _, _} -> run(name, fun)
      {:error, reason} -> {:error, {:read_error, reason}}
    end
  end

  defp run(log, fun) do
    close(log, fun.(log))
  rescue
    e ->
      _ = :disk_log.close(log)
      reraise e, __STACKTRACE__
  end

  defp close(log, result) do
    _ = :disk_log.close(log)
    result
  end

  # The header: its fields, its bytes (for the digest) and where the
  # objects begin.
  defp header(log) do
    with {:ok, cont, [bin | _], _bad} <- chunk(log, :start, 1),
         {:ok, tuple} when is_tuple(tuple) <- decode(bin),
         {:ok, h} <- fields(Tuple.to_list(tuple)) do
      {:ok, h, bin, cont}
    else
      {:error, _} = error -> error
      _ -> {:error, :badfile}
    end
  end

  defp fields(pairs) do
    found = for {k, v} <- pairs, k in @mandatory, into: %{}, do: {k, v}

    version = {Keyword.get(pairs, :major_version, 0), Keyword.get(pairs, :minor_version, 0)}

    extended =
      case List.keyfind(pairs, :extended_info, 0) do
        {:extended_info, l} when is_list(l) -> Enum.filter(l, &(&1 in [:object_count, :md5sum]))
        _ -> []
      end

    cond do
      not Enum.all?(pairs, &match?({_, _}, &1)) or map_size(found) != length(@mandatory) ->
        {:error, :badfile}

      not (is_atom(found.name) and found.type in @types and
             found.protection in [:public, :protected, :private] and
             is_boolean(found.named_table) and is_integer(found.keypos) and
             found.keypos >= 1 and is_integer(found.size)) ->
        {:error, :badfile}

      elem(version, 0) > 1 ->
        {:error, {:unsupported_file_version, version}}

      true ->
        {:ok, Map.merge(found, %{version: version, extended_info: extended})}
    end
  end

  defp create(h, opts) do
    options =
      [h.type, h.protection, {:keypos, h.keypos}] ++
        if(h.named_table, do: [:named_table], else: []) ++ Keyword.take(opts, [:arena])

    {:ok, Heft.new(h.name, options)}
  rescue
    ArgumentError -> {:error, :cannot_create_table}
    e in Heft.Error -> {:error, e.reason}
  end

  # Inserts the objects a chunk at a time, up to the end term (if any):
  # {:ok, objects read, the end's list or nil}. Undecodable terms are
  # skipped (damaged bytes a verifying read refuses at once); so is what
  # follows the end term.
  defp load(log, tab, cont, verify, md5, count) do
    case chunk(log, cont, @chunk) do
      :eof ->
        {:ok, count, nil}

      {:ok, _cont, _bins, bad} when verify and bad > 0 ->
        {:error, :badfile}

      {:ok, cont, bins, _bad} ->
        case objects(bins, md5, []) do
          {:more, objects, md5} ->
            with :ok <- insert(tab, objects),
                 do: load(log, tab, cont, verify, md5, count + length(objects))

          {:end, objects, md5, ending} ->
            with :ok <- insert(tab, objects), do: {:ok, count + length(objects), {ending, md5}}
        end

      {:error, _} = error ->
        error
    end
  end

  defp objects([], md5, acc), do: {:more, Enum.reverse(acc), md5}

  defp objects([bin | rest], md5, acc) do
    case decode(bin) do
      {:ok, [:"$end_of_table", ending]} -> {:end, Enum.reverse(acc), md5, ending}
      {:ok, object} -> objects(rest, md5 && :erlang.md5_update(md5, bin), [object | acc])
      :error -> objects(rest, md5, acc)
    end
  end

  # Objects Heft cannot take (not a tuple holding the key) are a bad file.
  defp insert(_tab, []), do: :ok

  defp insert(tab, objects) do
    case Heft.insert(tab, objects) do
      true -> :ok
      {:error, _} = error -> error
    end
  rescue
    ArgumentError -> {:error, :badfile}
  end

  # What the file promised, checked when verifying, as ETS checks it.
  defp check(_h, false, _md5, _count, _ending), do: :ok

  defp check(h, true, _md5, count, nil) do
    cond do
      h.extended_info != [] -> {:error, :badfile}
      count != h.size -> {:error, :invalid_object_count}
      true -> :ok
    end
  end

  defp check(h, true, _md5, count, {ending, md5}) do
    ending = if is_list(ending), do: ending, else: []

    cond do
      :md5sum in h.extended_info and
          :erlang.md5_final(md5) != Keyword.get(ending, :md5) ->
        {:error, :checksum_error}

      :object_count in h.extended_info and count != Keyword.get(ending, :count) ->
        {:error, :invalid_object_count}

      h.extended_info == [] and count != h.size ->
        {:error, :invalid_object_count}

      true ->
        :ok
    end
  end

  # disk_log:bchunk/3 as {:ok, cont, binaries, bad bytes skipped}.
  defp chunk(log, cont, n) do
    case :disk_log.bchunk(log, cont, n) do
      {cont, bins} when is_list(bins) -> {:ok, cont, bins, 0}
      {cont, bins, bad} -> {:ok, cont, bins, bad}
      :eof -> :eof
      {:error, reason} -> {:error, {:read_error, reason}}
    end
  end

  defp decode(bin) do
    {:ok, :erlang.binary_to_term(bin)}
  rescue
    ArgumentError -> :error
  end
end
