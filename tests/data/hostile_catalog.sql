CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE EXTENSION IF NOT EXISTS citext;
CREATE EXTENSION IF NOT EXISTS pg_surgery;
CREATE EXTENSION IF NOT EXISTS tablefunc;
CREATE EXTENSION IF NOT EXISTS pgstattuple;
CREATE EXTENSION IF NOT EXISTS postgres_fdw;
CREATE SCHEMA aws_s3;
CREATE FUNCTION aws_s3.query_export_to_s3(q text, bucket text) RETURNS int LANGUAGE sql AS 'SELECT 1';
CREATE SCHEMA cron;
CREATE FUNCTION cron.schedule(name text, command text) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';
CREATE SCHEMA net;
CREATE FUNCTION net.http_get(url text) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';
CREATE FUNCTION public.evil(x anyelement) RETURNS int LANGUAGE plpgsql VOLATILE
  AS $$BEGIN DELETE FROM events; RETURN 1; END$$;
CREATE FUNCTION public.fake_pure(x bigint) RETURNS bigint LANGUAGE plpgsql IMMUTABLE
  AS $$BEGIN PERFORM pg_catalog.pg_sleep(0); RETURN x; END$$;
CREATE FUNCTION public.owner_rights(x bigint) RETURNS bigint LANGUAGE sql IMMUTABLE SECURITY DEFINER
  AS 'SELECT x';
CREATE FUNCTION public.lo_total(x numeric) RETURNS numeric LANGUAGE sql IMMUTABLE AS 'SELECT x';
CREATE FUNCTION public.http_status(x text) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT x';
CREATE FUNCTION public.upper(x varchar) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT pg_catalog.lower(x)';
CREATE FUNCTION public.eq_evil(a text, b text) RETURNS bool LANGUAGE plpgsql IMMUTABLE
  AS $$BEGIN RETURN a = b; END$$;
CREATE OPERATOR public.=== (LEFTARG = text, RIGHTARG = text, FUNCTION = public.eq_evil);
CREATE OPERATOR public.~~~ (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_catalog.texteq);
CREATE FUNCTION public.add_evil(s bigint, x bigint) RETURNS bigint LANGUAGE plpgsql IMMUTABLE
  AS $$BEGIN RETURN s + x; END$$;
CREATE AGGREGATE public.evil_sum(bigint) (SFUNC = public.add_evil, STYPE = bigint, INITCOND = '0');
CREATE TYPE public.mood AS ENUM ('ok', 'sad');
CREATE FUNCTION public.check_fn(x text) RETURNS bool LANGUAGE plpgsql IMMUTABLE AS $$BEGIN RETURN true; END$$;
CREATE DOMAIN public.checked_text AS text CHECK (public.check_fn(VALUE));
CREATE DOMAIN public.short_text AS text CHECK (length(VALUE) < 100);
CREATE TYPE public.pair AS (a int, b int);
CREATE FUNCTION public.to_pair(x int) RETURNS public.pair LANGUAGE sql IMMUTABLE AS 'SELECT x, x';
CREATE CAST (int AS public.pair) WITH FUNCTION public.to_pair(int);
CREATE TABLE public.http_requests (id int, http_x text, lo_x text, nextval text);
CREATE VIEW public.paid_orders AS SELECT id, user_id, total_amount FROM orders WHERE status = 'paid';
CREATE INDEX orders_status_idx ON orders (status);
CREATE STATISTICS orders_stats ON status, user_id FROM orders;
CREATE MATERIALIZED VIEW daily AS SELECT date_trunc('day', created_at) AS day, count(*) AS n FROM orders GROUP BY 1;
CREATE SERVER elsewhere FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host 'localhost', dbname 'afs_demo');
CREATE FOREIGN TABLE public.remote_orders (id bigint) SERVER elsewhere OPTIONS (table_name 'orders');
CREATE VIEW public.evil_view AS SELECT id, public.evil(id) AS e FROM orders;
CREATE VIEW public.outer_view AS SELECT id FROM public.evil_view;
